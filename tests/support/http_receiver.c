/*
 * http_receiver.c - not written yet: exits 1, so that the unit suite
 * http_call's receiver tests can be seen failing first.
 */
#include <stdio.h>

int main(void)
{
	fputs("http_receiver: not written yet\n", stderr);
	return 1;
}
