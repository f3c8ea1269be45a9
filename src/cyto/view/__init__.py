"""The slide viewer (``cyto view``): a local web page for a scored slide or cohort.

The whole slide at every zoom level (deep-zoom tiles read on request through the readers
``cyto score`` used, cached on disk under the slide's identity), every scored cell as a marker
coloured by its score or FDR flag, the abnormality map of :mod:`cyto.infer.maps` at low zoom, the
top-K cells, the tissue mask and the tiles the pipeline skipped, and the slide's summary.

It shows ranks and scores, so it unblinds: it refuses a folder whose blinded review is not
finished unless asked to unblind (:func:`cyto.view.folder.open_view`).

- :mod:`cyto.view.folder`: the scored folder(s), their tables, the review check.
- :mod:`cyto.view.tiles`: the deep-zoom pyramid of a slide and its disk cache.
- :mod:`cyto.view.server`: the Starlette app and ``serve``; its posture is
  :mod:`cyto.localserver`'s (loopback, access key, no path from the request).
"""
