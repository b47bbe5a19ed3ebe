/*
 * ftrl_glue.h - what the two DP-FTRL SQL layers share (ftrl_fmgr.c, ftrl_shards_fmgr.c).
 */
#ifndef DPSQL_FTRL_GLUE_H
#define DPSQL_FTRL_GLUE_H

#include "fmgr.h"

#include "ftrl.h"

/* An epoch's settings (argument cfg_arg, not NULL) and S_prev (argument s_prev_arg, NULL:
 * zeros), checked, and its tree's levels: errors for bad settings, a wrong S_prev length or
 * too many leaves. */
void		dpsql_ftrl_epoch_args(FunctionCallInfo fcinfo, int cfg_arg, int s_prev_arg,
								  DpsqlFtrlConfig *cfg, double **s_prev, int *levels);

/* An ERROR for a core status: internal for DPSQL_E_STATE / DPSQL_E_LIMIT, else a bad
 * parameter; "dpsql: <where>: <what>", the status's message as the detail. */
void		dpsql_ftrl_raise(DpsqlStatus st, const char *where, const char *what);

#endif
