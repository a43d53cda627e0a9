"""Dense readouts of stored spatial maps: surface normals and semantic segmentation."""
