/* fake_server.h - a tiny scripted HTTP server on a unix socket, run in a
 * thread of the test process, for what a real worker or tool never sends:
 * an OpenAI-compatible engine whose "model" the test scripts, a tool that
 * holds or drips its answer, a worker /health with odd fields.
 *
 * One connection at a time: accept, read the request head and its
 * Content-Length body, hand it to the test's handler (which writes the
 * whole response on fd), then close. The accept loop polls a stop flag
 * every 100 ms, so fs_stop returns promptly.
 */
#ifndef SPILLWAY_TESTS_FAKE_SERVER_H
#define SPILLWAY_TESTS_FAKE_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct fs_server fs_server;

/* Answers one request: req is the whole request (head, then body),
 * NUL-terminated; body points into it after the blank line. */
typedef void (*fs_handler)(fs_server *s, int fd, const char *req, const char *body);

struct fs_server {
    int lfd;
    char path[600];   /* the socket's path (tu_tmp_path of the name) */
    atomic_bool stop;
    pthread_t th;
    size_t cap;       /* the request buffer's size */
    bool openai_gets; /* GETs answered as an OpenAI-compatible engine */
    fs_handler handle;
};

/* Binds and listens at tu_tmp_path(name) and starts the thread (each
 * step asserted). cap: the most a request may hold. openai_gets: GET
 * /v1/models lists one model "fake" and any other GET is a 404, the
 * handler seeing only the other methods (as a kind = openai worker's
 * engine); otherwise the handler sees every request. */
void fs_start(fs_server *s, const char *name, size_t cap, bool openai_gets, fs_handler handle);
/* Stops the thread, closes and removes the socket. */
void fs_stop(fs_server *s);

/* Reads one request (head and a Content-Length body) into buf,
 * NUL-terminated; *body after the head. false on EOF, error, time-out,
 * or a head that does not fit. */
bool fs_read_request(int fd, char *buf, size_t cap, const char **body);
/* Sends all n bytes; stops quietly when the peer is gone. */
void fs_send_all(int fd, const char *p, size_t n);
/* A whole response: status line, Content-Type, Content-Length,
 * "Connection: close", then len bytes of body. */
void fs_send_reply(int fd, int status, const char *ctype, const char *body, size_t len);

#endif
