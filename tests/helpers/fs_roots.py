"""The directories fs.rename may touch in tests: the system's temporary directory.

It is the directory under which pytest makes every ``tmp_path``. Workers started by tests get it
as TIDEMARK_FS_ROOTS."""

import tempfile

FS_ROOTS = tempfile.gettempdir()
