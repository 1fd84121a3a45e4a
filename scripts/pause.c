/*
 * rkubelet pause: minimal pod sandbox "infra" process.
 *
 * - SIGINT / SIGTERM: exit 0.
 * - SIGCHLD: reap every exited child (it is PID 1 of the pod's PID namespace
 *   when the namespace is shared).
 * - Otherwise: sleep forever in pause().
 *
 * Build: gcc -static -O2 -o pause pause.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "rkubelet-pause 3.10"

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_chld(int sig)
{
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    errno = saved;
}

static int install(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
    int i;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--version") == 0) {
            printf("%s\n", VERSION);
            return 0;
        }
    }

    if (getpid() != 1)
        fprintf(stderr, "pause: warning: not running as PID 1\n");

    if (install(SIGINT, on_term, 0) < 0 || install(SIGTERM, on_term, 0) < 0) {
        perror("pause: sigaction(SIGINT/SIGTERM)");
        return 1;
    }
    if (install(SIGCHLD, on_chld, SA_NOCLDSTOP | SA_RESTART) < 0) {
        perror("pause: sigaction(SIGCHLD)");
        return 2;
    }

    for (;;)
        pause();

    /* not reached */
    return 42;
}
