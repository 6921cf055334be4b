"""The TVM bridge: TIR programs as fastsearch's program model, loop nests, targets and the
machine the cost model assumes. The rest of the package reads TVM's IR through these modules."""
