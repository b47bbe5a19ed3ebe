/*
 * status.h - error codes shared by the C core and its two front ends.
 *
 * The core never aborts or prints: every function that can meet bad input returns one of
 * these codes, and the PostgreSQL glue turns it into an ERROR, the Cython binding into an
 * exception. dpsql_status_message() is the one place the wording lives.
 */
#ifndef DPSQL_STATUS_H
#define DPSQL_STATUS_H

typedef enum DpsqlStatus
{
	DPSQL_OK = 0,
	DPSQL_E_STATE,				/* model state array is malformed or of another version */
	DPSQL_E_STATE_MISMATCH,		/* two states of different shapes/hyperparameters combined */
	DPSQL_E_PARAM,				/* a hyperparameter is out of its domain */
	DPSQL_E_LENGTH,				/* feature array length differs from the model dimension */
	DPSQL_E_NONFINITE_X,		/* NaN or Inf among the features */
	DPSQL_E_NONFINITE_Y,		/* NaN or Inf label */
	DPSQL_E_LABEL,				/* label outside the loss's label set */
	DPSQL_E_DIVERGED,			/* the model became non-finite (step size too large) */
	DPSQL_E_LOSS,				/* unknown loss code */
	DPSQL_E_LIMIT,				/* a size or count above the core's documented limit */
	DPSQL_E_MEMORY				/* a work area could not be allocated */
} DpsqlStatus;

const char *dpsql_status_message(DpsqlStatus status);

#endif
