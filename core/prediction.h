/*
 * prediction.h - what a released model does to a row before and after the dot product, in one
 * place for the server (dpsql_internal._apply_bounds, dpsql_internal._is_positive) and Python (Model.predict).
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
 * A row as a model with preprocessing sees it (DPSGD-F): the feature bounds (if bounds is not
 * NULL), then the row transform of row_flags (DPSQL_FLAG_CLIP_ROWS / DPSQL_FLAG_UNIT_ROWS, as
 * in sgd.h), then minus centre (if not NULL). DPSQL_E_NONFINITE_X for a NaN or infinite
 * feature (a null record); DPSQL_E_PARAM for a bad bound (*bad receives its index).
 */
DpsqlStatus dpsql_preprocess(const double *x, int d, const double *bounds, int row_flags,
							 const double *centre, double *out, int *bad);

/*
 * The decision rule of a binary model: does the raw prediction (a probability for logistic,
 * a score for huber and linear) say the positive class? NaN says neither: -1.
 */
int			dpsql_is_positive(int loss, double raw);

#endif
