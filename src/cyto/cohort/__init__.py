"""Cohorts (``cyto.cohort``): many slides, on one machine or a Ray cluster.

Owns the cohort table (``cohort.csv``, merged under a lock), output folders per slide (colliding
names kept apart), tile ranges of one large slide and their merge, and the Ray actors that score
slides and ranges on other machines. Every slide goes through :mod:`cyto.infer`'s pipeline; a slide
that fails is reported and the cohort goes on.
"""

from __future__ import annotations

from cyto.cohort.local import score_cohort

__all__ = ["score_cohort"]
