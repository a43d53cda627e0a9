"""Feature rows read block by block on a compute device, never copied whole."""

from pipeline.protocols.blocks.feature_rows import FeatureRows
from pipeline.protocols.blocks.parts import CachedPart, StreamedPart, to_torch_block
from pipeline.protocols.blocks.scores import RowsPredictMixin, predict_from_scores
from pipeline.protocols.blocks.sizes import BLOCK_BYTES, STREAM_BLOCK_ROWS, Blocks, block_rows

__all__ = [
    "BLOCK_BYTES", "STREAM_BLOCK_ROWS", "Blocks", "CachedPart", "FeatureRows", "RowsPredictMixin",
    "StreamedPart", "block_rows", "predict_from_scores", "to_torch_block",
]
