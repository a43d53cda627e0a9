"""Checkpoint files as training code writes them: reading containers safely, finding the state dict and prefix that fit an architecture, and the names files give encoders."""
