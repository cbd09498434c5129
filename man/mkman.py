#!/usr/bin/env python3
"""mkman.py TEMPLATE PROGRAM VERSION MIGRATIONS_DIR PANDOC OUTPUT

A man page from its markdown TEMPLATE: each line "@GENERATED WORD@" is
replaced with what `PROGRAM --help-man WORD` prints (the program's own
option and settings tables, so the page cannot drift from --help), the
@VERSION@ and @MIGRATIONS_DIR@ words with theirs; pandoc writes the roff.
"""
import subprocess
import sys


def main():
    template, program, version, migrations, pandoc, output = sys.argv[1:7]
    out = []
    with open(template, encoding="utf-8") as f:
        for line in f:
            word = line.strip()
            if word.startswith("@GENERATED ") and word.endswith("@"):
                res = subprocess.run([program, "--help-man", word[len("@GENERATED "):-1]],
                                     capture_output=True, text=True, check=False)
                if res.returncode != 0 or not res.stdout.strip():
                    sys.exit(f"mkman: {program} --help-man {word} failed: {res.stderr.strip()}")
                out.append(res.stdout)
            else:
                out.append(line.replace("@VERSION@", version).replace("@MIGRATIONS_DIR@", migrations))
    res = subprocess.run([pandoc, "--standalone", "--from", "markdown", "--to", "man", "--output", output],
                         input="".join(out), text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"mkman: pandoc failed for {template}")


if __name__ == "__main__":
    main()
