/*
 * array.h - ARRAY_LEN, the number of elements of an array.  Counts that
 * must follow a table (one name per enum value) or a parameter list (the
 * `?` of a prepared statement) are computed with it instead of being
 * written beside the array, where they drift apart.
 *
 * Header only: a macro has no .c to go with it.  Given a pointer instead of
 * an array the division means nothing; gcc's -Wsizeof-pointer-div and
 * -Wsizeof-array-argument (both in -Wall, errors under -Werror) refuse it.
 */
#ifndef INBOX_ARRAY_H
#define INBOX_ARRAY_H

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
