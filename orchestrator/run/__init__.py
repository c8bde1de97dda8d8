"""The run: the driver's stages or task graph on a Ray cluster, the evaluation actors' pool, progress,
tracking, and the summary a finished run prints."""
