"""Inference on whole slides: readers, nuclei, patches, engines, writers (no training code)."""
