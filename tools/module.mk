# tools/: the `cudapool` command.
