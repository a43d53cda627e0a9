"""The feature store: key layout, provenance, completion bookkeeping, leases."""

from storage_schema.arrays import ArrayStatus, StoredArray
from storage_schema.backend import Backend
from storage_schema.keys import feature_key, features_group_key, labels_key, parse_feature_key
from storage_schema.leases import DEFAULT_TTL, Lease, LeaseInfo
from storage_schema.provenance import array_fingerprint, library_versions, stable_hash
from storage_schema.store import SCHEMA_VERSION, FeatureStore
from storage_schema.writing import ArraySpec, WriteResult

__all__ = [
    "ArraySpec", "ArrayStatus", "Backend", "DEFAULT_TTL", "FeatureStore", "Lease", "LeaseInfo", "SCHEMA_VERSION",
    "StoredArray", "WriteResult", "array_fingerprint", "feature_key", "features_group_key", "labels_key",
    "library_versions", "parse_feature_key", "stable_hash",
]
