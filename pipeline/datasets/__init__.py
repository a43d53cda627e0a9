"""Dataset adapters: a registry (``make_dataset``, ``list_datasets``) and the built-in adapters.

Built-in adapters: ``image_folder``, ``csv_manifest``, ``digits``, ``textures``, ``features``.
"""

from pipeline.datasets._registry import list_datasets, make_dataset, register_dataset
from pipeline.datasets.base import IMAGE_EXTENSIONS, DatasetAdapter
from pipeline.datasets.digits import DigitsDataset
from pipeline.datasets.features import PrecomputedFeaturesDataset
from pipeline.datasets.folders import CsvManifestDataset, ImageFolderDataset
from pipeline.datasets.textures import TexturesDataset, render_texture
from pipeline.datasets.torch_dataset import TorchImageDataset

__all__ = [
    "DatasetAdapter",
    "IMAGE_EXTENSIONS",
    "register_dataset",
    "make_dataset",
    "list_datasets",
    "ImageFolderDataset",
    "CsvManifestDataset",
    "DigitsDataset",
    "TexturesDataset",
    "render_texture",
    "PrecomputedFeaturesDataset",
    "TorchImageDataset",
]
