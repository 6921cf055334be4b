"""Proposing candidates: random sketches checked by TVM (``sample``), the model-guided search
with sibling tasks' records (``guided``) and warm starts from other shapes' databases
(``warm_start``)."""
