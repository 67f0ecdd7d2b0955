"""The hostile-input suite: generated corpora of hostile packs, warm-start
files and command lines, each case checked for a clean one-line error naming the file,
bounded time and memory, nothing changed on disk, and never a wrong byte served."""
