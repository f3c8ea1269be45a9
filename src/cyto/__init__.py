"""cyto: one-class detection of rare malignant cells in whole-slide cytology images.

Implements the approach of *Needle in a Haystack: One-Class Representation Learning for Detecting
Rare Malignant Cells in Computational Cytology* (Chatterjee et al., 2024).
"""

__version__ = "0.1.0"
