/*
 * names.c - user-facing names of losses and schedules.
 */
#include <string.h>

#include "losses.h"
#include "names.h"
#include "sgd.h"

typedef struct NameCode
{
	const char *name;
	int			code;
} NameCode;

/* The first entry of each code is its canonical name. */
static const NameCode loss_names[] = {
	{"logistic", DPSQL_LOSS_LOGISTIC},
	{"linear", DPSQL_LOSS_SQUARED},
	{"huber", DPSQL_LOSS_HUBER},
	{"multinomial", DPSQL_LOSS_MULTINOMIAL},
	{"squared", DPSQL_LOSS_SQUARED},
	{"least_squares", DPSQL_LOSS_SQUARED},
	{"huber_svm", DPSQL_LOSS_HUBER},
	{"svm", DPSQL_LOSS_HUBER},
	{"softmax", DPSQL_LOSS_MULTINOMIAL},
	{NULL, 0}
};

static const NameCode schedule_names[] = {
	{"constant", DPSQL_SCHEDULE_CONSTANT},
	{"decreasing", DPSQL_SCHEDULE_DECREASING},
	{"inverse", DPSQL_SCHEDULE_INVERSE},
	{"sqrt", DPSQL_SCHEDULE_SQRT},
	{NULL, 0}
};

static int
lookup(const NameCode *table, const char *name)
{
	for (; table->name != NULL; table++)
		if (strcmp(table->name, name) == 0)
			return table->code;
	return 0;
}

static const char *
reverse(const NameCode *table, int code)
{
	for (; table->name != NULL; table++)
		if (table->code == code)
			return table->name;
	return NULL;
}

int
dpsql_loss_from_name(const char *name)
{
	return lookup(loss_names, name);
}

const char *
dpsql_loss_name(int loss)
{
	return reverse(loss_names, loss);
}

int
dpsql_schedule_from_name(const char *name)
{
	return lookup(schedule_names, name);
}

const char *
dpsql_schedule_name(int schedule)
{
	return reverse(schedule_names, schedule);
}
