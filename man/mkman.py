#!/usr/bin/env python3
"""The man pages, three ways (man/meson.build calls each).

mkman.py TEMPLATE PROGRAM VERSION MIGRATIONS_DIR PANDOC OUTPUT
    A man page from its markdown TEMPLATE: each line "@GENERATED WORD@" is
    replaced with what `PROGRAM --help-man WORD` prints (the program's own
    option and settings tables, so the page cannot drift from --help), the
    @VERSION@ and @MIGRATIONS_DIR@ words with theirs; pandoc writes the roff.

mkman.py --dist PANDOC MIGRATIONS_DIR VERSION NAME PROGRAM [NAME PROGRAM]...
    A meson dist script: the same pages for the release tarball, written
    as $MESON_DIST_ROOT/man/NAME.1.in from the tarball's own NAME.1.md, so
    that a build from the tarball needs no pandoc.  The migrations folder
    depends on the prefix the tarball will be built with, so the pages keep
    a placeholder where it goes (also where the program printed this
    build's MIGRATIONS_DIR).  The PROGRAMs are this build's, built first.

mkman.py --prebuilt ROFF_IN MIGRATIONS_DIR OUTPUT
    A tarball's NAME.1.in with the placeholder replaced: the page pandoc
    would have written here, byte for byte (scripts/dist-check compares).
"""
import os
import shutil
import subprocess
import sys

# Where the migrations folder goes in a tarball's page: letters and digits
# only, which pandoc passes through as they are (an @word is a citation to
# pandoc's markdown, and would come out as \[at]word).
PLACEHOLDER = "MKMAN0MIGRATIONS0DIR"


def render(template, program, version, migrations):
    """The page's markdown, with the program's sections filled in."""
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
    return "".join(out)


def pandoc_to(pandoc, markdown, output, what):
    # --wrap=preserve: the roff keeps the markdown's lines, so that a path
    # put in later (--prebuilt) cannot change where pandoc broke them.
    res = subprocess.run([pandoc, "--standalone", "--wrap=preserve", "--from", "markdown", "--to", "man",
                          "--output", output], input=markdown, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"mkman: pandoc failed for {what}")


def build_programs(build_root, programs):
    """Build the programs --help-man is asked of, in the build meson dist
    was run from (it builds nothing before its dist scripts)."""
    ninja = shutil.which("ninja") or shutil.which("samu")
    if ninja is None:
        sys.exit("mkman: neither ninja nor samu found to build the programs the man pages read")
    targets = [os.path.relpath(p, build_root) for p in programs]
    res = subprocess.run([ninja, "-C", build_root] + targets, stdout=subprocess.DEVNULL, check=False)
    if res.returncode != 0:
        sys.exit(f"mkman: building {' '.join(targets)} in {build_root} failed")


def dist(args):
    if len(args) < 5 or len(args) % 2 != 1:
        sys.exit("usage: mkman.py --dist PANDOC MIGRATIONS_DIR VERSION NAME PROGRAM [NAME PROGRAM]...")
    pandoc, migrations, version = args[0:3]
    pages = list(zip(args[3::2], args[4::2]))
    if not pandoc:
        sys.exit("mkman: the release tarball carries the man pages, and this build found no pandoc to make "
                 "them (apt-get install pandoc, then meson setup --reconfigure)")
    dist_root = os.environ.get("MESON_DIST_ROOT")
    build_root = os.environ.get("MESON_BUILD_ROOT")
    if not dist_root or not build_root:
        sys.exit("mkman: --dist runs as a meson dist script (MESON_DIST_ROOT, MESON_BUILD_ROOT)")
    build_programs(build_root, [program for _, program in pages])
    for name, program in pages:
        template = os.path.join(dist_root, "man", name + ".1.md")
        output = os.path.join(dist_root, "man", name + ".1.in")
        # The program prints this build's migrations folder in its settings
        # section: the placeholder there too, for the prefix of the build
        # that will read the tarball.
        markdown = render(template, program, version, PLACEHOLDER).replace(migrations, PLACEHOLDER)
        pandoc_to(pandoc, markdown, output, template)
        print(f"mkman: man/{name}.1.in written into the tarball")


def prebuilt(args):
    if len(args) != 3:
        sys.exit("usage: mkman.py --prebuilt ROFF_IN MIGRATIONS_DIR OUTPUT")
    roff_in, migrations, output = args
    with open(roff_in, encoding="utf-8") as f:
        roff = f.read()
    # Mid-line in running text a backslash is roff's only special
    # character; pandoc writes a path's other characters as they are.
    with open(output, "w", encoding="utf-8") as f:
        f.write(roff.replace(PLACEHOLDER, migrations.replace("\\", "\\e")))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--dist":
        dist(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--prebuilt":
        prebuilt(sys.argv[2:])
    elif len(sys.argv) == 7:
        template, program, version, migrations, pandoc, output = sys.argv[1:7]
        pandoc_to(pandoc, render(template, program, version, migrations), output, template)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
