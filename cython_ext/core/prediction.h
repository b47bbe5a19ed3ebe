/*
 * prediction.h - what a released model does to a row before and after the dot product, in one
 * place for the server (dpsql._apply_bounds, dpsql._is_positive) and Python (Model.predict).
 */
#ifndef DPSQL_PREDICTION_H
#define DPSQL_PREDICTION_H

#include "status.h"

/*
 * Public per-feature bounds (d rows of lo, hi): each feature is clipped to [lo, hi] and mapped
 * linearly onto [-1, 1]; NaN stays NaN (the aggregate decides what to do with it).
 * DPSQL_E_PARAM when a bound is not a finite interval lo < hi (*bad receives its index).
 */
DpsqlStatus dpsql_bound_features(const double *bounds, int d, const double *x, double *out,
							   int *bad);

/*
 * The decision rule of a binary model: does the raw prediction (a probability for logistic,
 * a score for huber and linear) say the positive class? NaN says neither: -1.
 */
int			dpsql_is_positive(int loss, double raw);

#endif
