"""The doors every command goes through: `output` for every file written, `inputs` for every
file read (beside the reader's `open_regular`)."""
