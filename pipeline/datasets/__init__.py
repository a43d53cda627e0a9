"""Dataset adapters: a registry (``make_dataset``, ``list_datasets``) and the built-in adapters."""

from pipeline.datasets.registry import adapter_class, list_datasets, make_dataset, register_dataset
from pipeline.datasets.adapters.ade20k import Ade20kDataset
from pipeline.datasets.base import IMAGE_EXTENSIONS, METRICS, DatasetAdapter
from pipeline.datasets.adapters.cdfsl import ChestXDataset, CropDiseasesDataset, EuroSatDataset, Isic2018Dataset
from pipeline.datasets.adapters.cifar import Cifar10Dataset, Cifar100Dataset
from pipeline.datasets.adapters.digits import DigitsDataset
from pipeline.datasets.adapters.features import PrecomputedFeaturesDataset
from pipeline.datasets.adapters.folders import CsvManifestDataset, ImageFolderDataset
from pipeline.datasets.adapters.hf import HuggingFaceDataset
from pipeline.datasets.adapters.imagenet import ImageNetDataset
from pipeline.datasets.inspection import dataset_summary, format_summary, show_dataset
from pipeline.datasets.listing import ListedImageDataset, Listing, PublishedDataset
from pipeline.datasets.adapters.dense import DenseDataset
from pipeline.datasets.adapters.natural import Caltech101Dataset, CarsDataset, Food101Dataset, Sun397Dataset
from pipeline.datasets.adapters.nyuv2 import Nyuv2NormalsDataset
from pipeline.datasets.adapters.oxford import AircraftDataset, DtdDataset, Flowers102Dataset, PetsDataset
from pipeline.datasets.adapters.textures import TexturesDataset, render_texture
from pipeline.datasets.adapters.voc import VOC_CLASSES, Voc2007Dataset
from pipeline.datasets.adapters.voc_segmentation import VocSegmentationDataset
from pipeline.datasets.adapters.webdataset import WebDatasetShards


def __getattr__(name: str):
    if name == "TorchImageDataset":
        # deferred: TorchImageDataset needs torch; listing or inspecting datasets (the CLI) never does
        from pipeline.datasets.torch_dataset import TorchImageDataset

        return TorchImageDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DatasetAdapter",
    "IMAGE_EXTENSIONS",
    "METRICS",
    "register_dataset",
    "make_dataset",
    "list_datasets",
    "adapter_class",
    "dataset_summary",
    "format_summary",
    "show_dataset",
    "ListedImageDataset",
    "Listing",
    "PublishedDataset",
    "ImageFolderDataset",
    "CsvManifestDataset",
    "DigitsDataset",
    "TexturesDataset",
    "render_texture",
    "PrecomputedFeaturesDataset",
    "TorchImageDataset",
    "WebDatasetShards",
    "HuggingFaceDataset",
    "AircraftDataset",
    "DtdDataset",
    "Flowers102Dataset",
    "PetsDataset",
    "Caltech101Dataset",
    "CarsDataset",
    "Food101Dataset",
    "Sun397Dataset",
    "Cifar10Dataset",
    "Cifar100Dataset",
    "Voc2007Dataset",
    "VOC_CLASSES",
    "ImageNetDataset",
    "CropDiseasesDataset",
    "EuroSatDataset",
    "Isic2018Dataset",
    "ChestXDataset",
    "DenseDataset",
    "Ade20kDataset",
    "VocSegmentationDataset",
    "Nyuv2NormalsDataset",
]
