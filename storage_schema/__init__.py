"""The feature store: key layout, provenance, completion bookkeeping, leases."""

from storage_schema.backend import Backend
from storage_schema.keys import feature_key, features_group_key, labels_key, parse_feature_key
from storage_schema.leases import Lease, LeaseInfo
from storage_schema.provenance import array_fingerprint, library_versions, stable_hash
from storage_schema.store import SCHEMA_VERSION, ArrayStatus, FeatureStore, StoredArray

__all__ = [
    "ArrayStatus", "Backend", "FeatureStore", "Lease", "LeaseInfo", "SCHEMA_VERSION", "StoredArray",
    "array_fingerprint", "feature_key", "features_group_key", "labels_key", "library_versions",
    "parse_feature_key", "stable_hash",
]
