"""Network definitions shared by training, export and inference (no optimizers, no file IO)."""
