"""Blinded expert review of the top-K cells, as in the paper's clinical evaluation.

A review folder is built once from scored slide folders (:mod:`cyto.review.session`): every
slide's top-K cells of each model, pooled and deduplicated, in a seeded random order under an
anonymized case id, with the unblinding key kept apart. :mod:`cyto.review.server` serves it as a
local web page that writes every mark at once to an append-only store
(:mod:`cyto.review.store`); :mod:`cyto.review.report` unblinds the marks into the paper's expert
table and review figure.
"""
