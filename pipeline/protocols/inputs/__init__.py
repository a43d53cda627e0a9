"""The one input contract of every probe and protocol: what ``fit`` and a protocol's run
accept, checked before any work, each refusal one line naming the value and what is valid.

- ``features``: pooled (n, d) and token (n, T, d) feature arrays (finite; float16/32/64
  kept as they are, never copied).
- ``labels``: class labels of any sortable hashable type, the store's integer class
  indices, multi-label arrays, the validation split.
- ``parameters``: an estimator's numeric parameters and grids; protocol-setting grids
  (a protocol's settings are resolved in ``pipeline.protocols.settings``).
- ``devices``: the ``device`` setting (checked without torch, resolved with it; the registry
  adds it to an entry that ``runs_on_device``).
- ``cell_data``: what a protocol is given as a whole (``EvalData``, ``DenseData``,
  ``ImageData``) against what its entry reads.

The modules are imported by name (``from pipeline.protocols.inputs.labels import
encode_labels``): the device names are checked on the command line's fast path, which
must not load scikit-learn.
"""
