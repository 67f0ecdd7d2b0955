"""Files: the one way tierstore writes a file (``atomic``: temp, fsync, rename, directory
fsync, cleanup on any failure) and the one way it reads a file it did not write
(``untrusted``: regular files only, size caps, linear-time JSON checks, strict parse)."""
