"""Test helper run *inside* a job: writes its argv (as JSON) or a copy of a file to $ECHO_OUT."""

import json
import os
import shutil
import sys

if len(sys.argv) == 3 and sys.argv[1] == "--copy":
    shutil.copyfile(sys.argv[2], os.environ["ECHO_OUT"])
else:
    with open(os.environ["ECHO_OUT"], "w", encoding="utf-8") as fh:
        json.dump(sys.argv[1:], fh, ensure_ascii=False)
