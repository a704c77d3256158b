"""The command line: one module per command, the output convention every command follows
(`conventions`), and the options several commands share (`options`)."""
