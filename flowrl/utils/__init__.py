"""Utilities with no knowledge of parts or training: crash-safe JSON-lines files, logged numbers, video clips,
the learning-rate factor, the cluster a launch runs on and the library warnings flowrl silences."""
