"""Reduced-dynamics trees from the exact model: build (boxes, splines; over processes or Dask),
verify, accuracy, plots, summaries, the shipped trees."""
