"""The early pass: a new encoder judged from a chosen part of each dataset before its exact
figures exist (``docs/early.md``).

- ``subsets``: which rows each dataset's early pass reads, chosen once and kept;
- ``rows``: the early feature arrays, and the early rows a full extraction copies instead
  of computing again;
- ``extract``: the forward pass over the early rows;
- ``results``: a readout fitted on the early rows (of a new encoder, or of an earlier one
  from its stored features, for calibration);
- ``estimates``: the early estimate of every full figure, its interval and early verdicts;
- ``checks``: each estimate against the exact figure that followed, and coverage;
- ``lines``: what the terminal, the summary and the report say of them.
"""
