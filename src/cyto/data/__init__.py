"""Cell-patch datasets, augmentations and the synthetic cytology generator.

Submodules are imported on demand so that ``cyto --help`` stays light.
"""
