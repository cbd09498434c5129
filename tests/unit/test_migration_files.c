/*
 * test_migration_files.c - what the files of migrations/ say of themselves
 * (migration.h's annotations), read as migrate reads them.
 *
 * Every numbered file says whether workers of the release before keep
 * running while it is applied (@online) and which tables it holds, how
 * (@locks); a file that drops what an earlier release uses is a contract
 * file.  Annotations stay out of the checksum, so a file released before
 * it had them keeps the checksum its release recorded in every database:
 * the table below is those records, taken from 0.8.0's files, and a file
 * whose statements changed since must name its old text (@replaces).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "migration.h"
#include "status.h"

static const char *migrations_dir(void)
{
	static char dir[4096];
	const char *root = getenv("INBOX_SOURCE_ROOT");

	cr_assert_not_null(root, "INBOX_SOURCE_ROOT is set by meson");
	snprintf(dir, sizeof dir, "%s/migrations", root);
	return dir;
}

/* The checksums 0.8.0 (1b3eb53) recorded, one per file it shipped. */
static const struct {
	const char *name, *sha256;
} released[] = {
	{ "0001_inbox.sql", "aca948bc9558ee549a394353732f1a5d81587bf38499c98e83dfefe85e792418" },
	{ "0002_saga.sql", "619f276fbdf5ec5cce3971610c70994f3498809fda9483881429033a8486ec72" },
	{ "0003_claim_procedure.sql", "d9d9c6d8cebc30b953806dce33b76751e0e708dd262c326a4d3eda7d0f4baced" },
	{ "0004_settle_procedure.sql", "68fe415ab8590fff510a2bca46ff2eb5d88f79d3db2484c24fd75c60115fec2e" },
	{ "0005_outbox_retry.sql", "0646dc2e6e961d3022b16efcd1ccc9bd3c5edf87bb7881b1549a9c23767ebd2f" },
	{ "0010_batch_claim.sql", "0857675009fde3dea49e29713c6a17b7a39690e45a2b25750d09aed62f2bc1c2" },
	{ "0011_no_procedures.sql", "d1bd4ed883875bf57b738c9908634261854daa483580466f3ba7b41af12f6aac" },
	{ "0012_held_at.sql", "b6cb051e0b56e528dcc904bd832e59c2e9a75e0cecb444c71073b6296d1ae80a" },
	{ "0014_outbox_lease.sql", "76cead01b38e660a0cf22f6338b4e57367fff18304c99d206ed8a33643b92250" },
	{ "0015_ledger_payload_hash.sql", "1f78ec2e78a52a91424505a763b3259a8b3d5d93e9b49a5a000e56fe7262a2c1" },
	{ "0016_text_utf8mb4.sql", "44f4f569de4782b58868dbf1e5386c718d88efef1600b9e408f1a25e6702ee01" },
	{ "0017_env_key_width.sql", "60c1fdeb00c45930f0aeaf91b24a6722b2bd4875fab90d8ae7322bab0b2c2925" },
	{ "0018_fleet_outbox_claim.sql", "c726d7527cbf4c7ea12ed5f45b5d322e3c4abccf916a88d67c36d072b24d5a9d" },
	{ "0019_outbox_destination.sql", "8775be4474a48b3fd56d6039fd87e15276608263a11b64b36d0eb71258551937" },
};

Test(migration_files, every_numbered_file_says_what_a_running_fleet_meets)
{
	char **names = NULL;
	int count = 0;

	cr_assert_eq(migration_list_numbered(migrations_dir(), &names, &count), ST_OK);
	cr_assert_gt(count, 14);
	for (int i = 0; i < count; i++) {
		struct migration_file f;

		cr_assert_eq(migration_read_file(migrations_dir(), names[i], &f), ST_OK, "%s", names[i]);
		cr_expect(f.online, "%s says nothing of the workers running while it is applied (-- @online)", names[i]);
		cr_expect(f.locks, "%s says nothing of what it locks (-- @locks)", names[i]);
		migration_file_free(&f);
	}
	migration_names_free(names, count);
}

Test(migration_files, the_files_that_drop_what_earlier_workers_call_are_contract_files)
{
	static const char *const contract[] = { "0011_no_procedures.sql", "0021_contract_claim_procedures.sql" };

	for (size_t i = 0; i < sizeof contract / sizeof contract[0]; i++) {
		struct migration_file f;

		cr_assert_eq(migration_read_file(migrations_dir(), contract[i], &f), ST_OK, "%s", contract[i]);
		cr_expect(f.contract, "%s drops procedures an earlier release calls: -- @contract", contract[i]);
		migration_file_free(&f);
	}
	{
		struct migration_file f;

		cr_assert_eq(migration_read_file(migrations_dir(), "0010_batch_claim.sql", &f), ST_OK);
		cr_expect(!f.contract, "0010 adds what the next release needs: applied under the running fleet");
		cr_expect_null(strstr(f.sql, "DROP PROCEDURE"), "0.1.0's procedures go with 0021, not 0010");
		migration_file_free(&f);
	}
}

Test(migration_files, a_released_file_keeps_the_checksum_its_release_recorded)
{
	for (size_t i = 0; i < sizeof released / sizeof released[0]; i++) {
		struct migration_file f;

		cr_assert_eq(migration_read_file(migrations_dir(), released[i].name, &f), ST_OK, "%s", released[i].name);
		cr_expect(migration_file_matches(&f, released[i].sha256),
		          "%s no longer matches the record 0.8.0 made (%s; now %s): a database migrated by it would refuse"
		          " this build; name the old text with -- @replaces",
		          released[i].name, released[i].sha256, f.sha256);
		migration_file_free(&f);
	}
}

/* dir/name with text; the folder is the test's. */
static void put(const char *dir, const char *name, const char *text)
{
	char path[4200];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	cr_assert_geq(fputs(text, f), 0);
	cr_assert_eq(fclose(f), 0);
}

Test(migration_files, annotations_stay_out_of_the_checksum_and_a_typo_is_refused)
{
	char dir[] = "/tmp/inbox-migration-files-XXXXXX";
	struct migration_file a, b, c, d;
	static const char body[] = "-- why\nALTER TABLE t ADD COLUMN c INT NULL;\n";

	cr_assert_not_null(mkdtemp(dir));
	put(dir, "0001_plain.sql", body);
	put(dir, "0002_annotated.sql",
	    "-- @online yes\n-- why\n-- @locks t: INSTANT\n-- @contract drops\n"
	    "-- @replaces 0857675009fde3dea49e29713c6a17b7a39690e45a2b25750d09aed62f2bc1c2 the old text\n"
	    "ALTER TABLE t ADD COLUMN c INT NULL;\n");
	put(dir, "0003_typo.sql", "-- @lokcs t\nALTER TABLE t ADD COLUMN c INT NULL;\n");
	put(dir, "0004_short.sql", "-- @replaces 0857 not a checksum\nSELECT 1;\n");
	cr_assert_eq(migration_read_file(dir, "0001_plain.sql", &a), ST_OK);
	cr_assert_eq(migration_read_file(dir, "0002_annotated.sql", &b), ST_OK);
	cr_expect_str_eq(a.sha256, b.sha256, "the annotations changed the checksum");
	cr_expect(!a.contract && !a.online && !a.locks && a.nreplaces == 0);
	cr_expect(b.contract && b.online && b.locks && b.nreplaces == 1);
	cr_expect(migration_file_matches(&b, "0857675009fde3dea49e29713c6a17b7a39690e45a2b25750d09aed62f2bc1c2"));
	cr_expect(!migration_file_matches(&b, "0000000000000000000000000000000000000000000000000000000000000000"));
	cr_expect_eq(b.len, strlen(b.sql), "the text sent is the whole file");
	cr_expect_eq(migration_read_file(dir, "0003_typo.sql", &c), ST_ERR_INVALID, "an unknown annotation is refused");
	cr_expect_eq(migration_read_file(dir, "0004_short.sql", &d), ST_ERR_INVALID, "@replaces needs a checksum");
	migration_file_free(&a);
	migration_file_free(&b);
	migration_file_free(&c);
	migration_file_free(&d);
	{
		char cmd[4200];

		snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
		cr_assert_eq(system(cmd), 0);
	}
}
