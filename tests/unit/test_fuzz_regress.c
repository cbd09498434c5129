/*
 * test_fuzz_regress.c - the fuzz targets' checks without libFuzzer: every
 * seed of fuzz/corpus/<target>/ and every saved finding of
 * fuzz/regress/<target>/ goes through fuzz_msg_one / fuzz_props_one (the
 * very functions the fuzzers call), so the ordinary build exercises the
 * targets' code paths and keeps each past crash fixed.
 *
 * A broken check aborts (FUZZ_CHECK); the file being fed is printed first
 * so that criterion's "crashed" names it.  Reproduce one under the fuzzer
 * with build-fuzz/fuzz/fuzz_<target> FILE.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#define INPUT_MAX (1 << 20)

/* Feed every regular file of root/dir to one; returns how many. */
static int feed_dir(const char *dir, void (*one)(const uint8_t *, size_t))
{
	const char *root = getenv("INBOX_SOURCE_ROOT");
	static uint8_t buf[INPUT_MAX];
	char path[4096];
	struct dirent *e;
	DIR *d;
	int n = 0;

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is not set (run through meson test)");
	snprintf(path, sizeof path, "%s/%s", root, dir);
	d = opendir(path);
	if (d == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		FILE *f;
		size_t len;

		if (e->d_name[0] == '.' || strcmp(e->d_name, "README") == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s/%s", root, dir, e->d_name);
		f = fopen(path, "rb");
		cr_assert_not_null(f, "%s: cannot open", path);
		len = fread(buf, 1, sizeof buf, f);
		cr_assert(ferror(f) == 0, "%s: read error", path);
		cr_assert(feof(f), "%s: larger than %d bytes", path, INPUT_MAX);
		fclose(f);
		fprintf(stderr, "fuzz_regress: %s\n", path);
		one(buf, len);
		n++;
	}
	closedir(d);
	return n;
}

Test(fuzz_regress, msg)
{
	int seeds = feed_dir("fuzz/corpus/msg", fuzz_msg_one);

	feed_dir("fuzz/regress/msg", fuzz_msg_one);
	cr_assert_geq(seeds, 20, "fuzz/corpus/msg holds %d seeds", seeds);
}

Test(fuzz_regress, props)
{
	int seeds = feed_dir("fuzz/corpus/props", fuzz_props_one);

	feed_dir("fuzz/regress/props", fuzz_props_one);
	cr_assert_geq(seeds, 10, "fuzz/corpus/props holds %d seeds", seeds);
}

Test(fuzz_regress, envelope)
{
	int seeds = feed_dir("fuzz/corpus/envelope", fuzz_envelope_one);

	feed_dir("fuzz/regress/envelope", fuzz_envelope_one);
	cr_assert_geq(seeds, 20, "fuzz/corpus/envelope holds %d seeds", seeds);
}
