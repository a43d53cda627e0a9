"""Feature rows read block by block on a compute device, never copied whole.

* ``sizes``: block budgets (``BLOCK_BYTES``, ``block_rows``) and the ``Blocks`` callable type;
* ``parts``: the parts rows are joined from (in memory, streamed, streamed rows kept);
* ``feature_rows``: ``FeatureRows``, the splits joined as one virtual row array, selected
  and followed by a fitted row map (``with_map``);
* ``scores``: block-wise predictions from class scores (``predict_from_scores``,
  ``RowsPredictMixin``).
"""

from pipeline.protocols.blocks.feature_rows import FeatureRows
from pipeline.protocols.blocks.parts import CachedPart, StreamedPart, to_torch_block
from pipeline.protocols.blocks.scores import RowsPredictMixin, predict_from_scores
from pipeline.protocols.blocks.sizes import BLOCK_BYTES, STREAM_BLOCK_ROWS, Blocks, block_rows

__all__ = [
    "BLOCK_BYTES", "STREAM_BLOCK_ROWS", "Blocks", "CachedPart", "FeatureRows", "RowsPredictMixin",
    "StreamedPart", "block_rows", "predict_from_scores", "to_torch_block",
]
