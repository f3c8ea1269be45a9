"""Training: one module per method of *Needle in a Haystack*, one shared training loop.

Importing a method module registers it; :func:`cyto.train.registry.get_method` imports them all.
"""
