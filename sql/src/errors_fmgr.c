/*
 * errors_fmgr.c - dpsql's refusals as short errors: the message and the hint say what went
 * wrong and what to do, without a CONTEXT that lists PL/pgSQL frames and 40-type signatures.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/elog.h"

#include "glue.h"

PG_FUNCTION_INFO_V1(dpsql_fail_sql);

static emit_log_hook_type prev_emit_log_hook = NULL;

/*
 * A dpsql refusal raised by PL/pgSQL's RAISE (not an internal error, SQLSTATE class XX)
 * needs no call stack. The C functions' own errcontext (which state, which row) stays.
 */
static bool
is_refusal(const ErrorData *edata)
{
	return edata->elevel >= ERROR && edata->message != NULL &&
		strncmp(edata->message, "dpsql: ", 7) == 0 &&
		PGUNSIXBIT(edata->sqlerrcode) != 'X' &&
		edata->funcname != NULL && strcmp(edata->funcname, "exec_stmt_raise") == 0;
}

/*
 * Drops the CONTEXT of those refusals once this module is loaded (the hook runs before the
 * report goes to the log and the client).
 */
static void
short_refusals(ErrorData *edata)
{
	if (is_refusal(edata))
		edata->context = NULL;
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

void
dpsql_install_error_hook(void)
{
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = short_refusals;
}

/*
 * dpsql_internal._fail(message, code, hint): ERROR "dpsql: message" with SQLSTATE code
 * (default 22023) and the hint when it is not empty. Loading the module here also installs
 * the hook above for later RAISEs.
 */
Datum
dpsql_fail_sql(PG_FUNCTION_ARGS)
{
	char	   *message = PG_ARGISNULL(0) ? pstrdup("(no message)") : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *code = PG_ARGISNULL(1) ? pstrdup("22023") : text_to_cstring(PG_GETARG_TEXT_PP(1));
	char	   *hint = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	int			sqlstate = ERRCODE_INVALID_PARAMETER_VALUE;

	if (strlen(code) == 5 && strspn(code, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") == 5)
		sqlstate = MAKE_SQLSTATE(code[0], code[1], code[2], code[3], code[4]);
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dpsql: _fail got SQLSTATE \"%s\" (five digits or capitals)", code)));
	/* No frames: the caller's PL/pgSQL and SQL contexts would only repeat the call. */
	if (sqlstate != ERRCODE_INTERNAL_ERROR && PGUNSIXBIT(sqlstate) != 'X')
		error_context_stack = NULL;
	ereport(ERROR,
			(errcode(sqlstate),
			 errmsg("dpsql: %s", message),
			 (hint != NULL && hint[0] != '\0') ? errhint("%s", hint) : 0));
	PG_RETURN_NULL();
}
