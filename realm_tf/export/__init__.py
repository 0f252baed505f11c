"""SavedModel exports with in-graph tokenization: what the index builder and server load."""
from realm_tf.export.encoders import (
    BlockEncoder, QueryEncoder, export_encoder, latest_encoder_export, load_encoder)

__all__ = ["BlockEncoder", "QueryEncoder", "export_encoder", "latest_encoder_export",
           "load_encoder"]
