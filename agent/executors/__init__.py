"""Carrying out commands: the loop, the in-process and launcher restarts, the NVRx store host."""
