"""Statistics on scores (``cyto.stats``): what a slide's scores mean against slide-negative ones.

Owns the calibration store kept in a bundle (scores of slide-negative slides), conformal p-values,
false-discovery-rate control (Benjamini-Hochberg, adaptive), the abnormal-cell burden with its
interval and the slide-level test. Pure numpy over score arrays; imports only the bundle contract
and ``cyto.errors``.
"""
