/*
 * accountant.c - the DP-SGD accountant, run outside the server.
 *
 * Composition and amplification come from Google's dp-accounting library (DESIGN.md rule 6),
 * which is Python: the server runs the command in dpsql.accountant_command (set by a superuser;
 * the embedded server sets it to this package's `python -m dpsql.accounting`) with one JSON
 * argument and reads one JSON line back. The request is built by dpsql's own SQL from checked
 * numbers; its characters are still checked here before they reach the shell.
 */
#include "postgres.h"

#include <ctype.h>

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_accountant);

static char *accountant_command = NULL;

void
dpsql_define_accountant_gucs(void)
{
	DefineCustomStringVariable("dpsql.accountant_command",
							   "Command that runs the dp-accounting accountant (python -m dpsql.accounting).",
							   NULL, &accountant_command, "", PGC_SUSET, 0, NULL, NULL, NULL);
#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("dpsql");
#endif
}

/* dpsql._accountant(request text) -> text: the accountant's one-line JSON answer. */
Datum
dpsql_accountant(PG_FUNCTION_ARGS)
{
	char	   *request = text_to_cstring(PG_GETARG_TEXT_PP(0));
	StringInfoData cmd;
	StringInfoData out;
	FILE	   *pipe;
	char		buf[1024];
	const char *c;
	int			status;

	if (accountant_command == NULL || accountant_command[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("dpsql: no privacy accountant configured"),
				 errhint("Set dpsql.accountant_command to \"<python> -m dpsql.accounting\" "
						 "(the embedded server does this), with dp-accounting installed.")));
	for (c = request; *c; c++)
		if (!(isalnum((unsigned char) *c) || strchr("{}[]\":,._- +", *c) != NULL))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dpsql: unexpected character in an accountant request")));
	initStringInfo(&cmd);
	appendStringInfo(&cmd, "%s '%s' 2>&1", accountant_command, request);
	pipe = OpenPipeStream(cmd.data, PG_BINARY_R);
	if (pipe == NULL)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("dpsql: could not run the accountant \"%s\": %m", accountant_command)));
	initStringInfo(&out);
	while (fgets(buf, sizeof(buf), pipe) != NULL && out.len < 65536)
		appendStringInfoString(&out, buf);
	status = ClosePipeStream(pipe);
	if (status != 0)
		ereport(ERROR,
				(errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION),
				 errmsg("dpsql: the accountant failed (status %d)", status),
				 errdetail("%s", out.data)));
	PG_RETURN_TEXT_P(cstring_to_text(out.data));
}
