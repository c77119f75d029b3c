"""Developer tools: a local S3 server for tests and the demo."""
