/*
 * names.h - the user-facing names of losses and schedules (SQL and Python share them).
 */
#ifndef DPSQL_NAMES_H
#define DPSQL_NAMES_H

/* Loss code for a model name ("logistic", "linear", "huber", "multinomial" and aliases); 0 if unknown. */
int			dpsql_loss_from_name(const char *name);
/* Canonical model name of a loss code, or NULL. */
const char *dpsql_loss_name(int loss);
/* Schedule code for "constant", "decreasing", "inverse", "sqrt"; 0 if unknown. */
int			dpsql_schedule_from_name(const char *name);
const char *dpsql_schedule_name(int schedule);

#endif
