"""Scoring candidates: per-store features (``features``) and the learned models trained on a
run's measurements (``learned``)."""
