/*
 * status.c - the wording of every core error.
 */
#include "status.h"

const char *
dpsql_status_message(DpsqlStatus status)
{
	switch (status)
	{
		case DPSQL_OK:
			return "ok";
		case DPSQL_E_STATE:
			return "malformed model state (wrong length, version or header)";
		case DPSQL_E_STATE_MISMATCH:
			return "cannot combine model states of different shapes or hyperparameters";
		case DPSQL_E_PARAM:
			return "hyperparameter out of range";
		case DPSQL_E_LENGTH:
			return "feature array length does not match the model dimension";
		case DPSQL_E_NONFINITE_X:
			return "feature array contains NaN or Infinity";
		case DPSQL_E_NONFINITE_Y:
			return "label is NaN or Infinity";
		case DPSQL_E_LABEL:
			return "label outside the loss's label set (logistic/huber: -1 or +1; multinomial: class index 0..C-1)";
		case DPSQL_E_DIVERGED:
			return "the model diverged (non-finite weights): lower the step size or clip the rows";
		case DPSQL_E_LOSS:
			return "unknown loss";
		case DPSQL_E_LIMIT:
			return "a size or count exceeds its limit";
		case DPSQL_E_MEMORY:
			return "out of memory for a work area";
	}
	return "unknown error";
}
