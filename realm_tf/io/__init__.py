"""File-system protocols shared by trainer, index builder, evaluator and server."""
