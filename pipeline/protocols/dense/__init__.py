"""Dense readouts of stored spatial maps: surface normals and semantic segmentation.

A map layer (``block<i>.map``, (n, h, w, d) float16) of a dense dataset is read whole with
its per-pixel targets; a small head is trained on the frozen maps, its output upsampled
bilinearly to the targets' resolution, and scored over every pixel of the test split.

- :mod:`~pipeline.protocols.dense.data`: what a dense cell hands a protocol, and its checks;
- :mod:`~pipeline.protocols.dense.metrics`: angular errors and the confusion-matrix mIoU,
  per image (evidence) and over the set, in numpy;
- :mod:`~pipeline.protocols.dense.heads`: the heads (torch);
- :mod:`~pipeline.protocols.dense.training`: the resumable SGD loop with polynomial decay;
- :mod:`~pipeline.protocols.dense.runners`: the ``normals`` and ``segmentation`` runners;
- :mod:`~pipeline.protocols.dense.memory`: the peak memory of a dense cell.

They are registered by :mod:`pipeline.protocols.dense.protocols`. Importing this package
imports neither torch nor the submodules.
"""
