/*
 * berth-launcher: package launcher's Launcher (serve.go) without the Go
 * runtime (issue 23, part 1). It speaks the same protocol on descriptor 3
 * (launcher.go: encode, answerSize) and gives the same guarantees: each
 * process leads a new process group (setpgid) or, in session mode, a new
 * session with its stdin as controlling terminal (setsid, TIOCSCTTY); it
 * is born with oom_score_adj 1000 while the launcher keeps the agent's; the
 * launcher's RLIMIT_NOFILE is argv[1]'s soft limit, which children
 * inherit; it is forked with CLONE_PARENT, and the launcher answers and
 * leaves when the kernel ignored that flag; a file the kernel cannot
 * execute (ENOEXEC) is run by /bin/sh. The child is made with
 * clone(CLONE_VM | CLONE_VFORK): nothing of the launcher's address space is
 * copied, and the child reports its execve(2) errno in the memory it
 * shares with the launcher, which resumes once the child has exec'd or
 * exited.
 *
 * Usage: berth-launcher NOFILE [reap] (argv[0] as the agent sets it).
 * With "reap" it is package launcher's ReapingLauncher (serve_reaping.go)
 * for kernels that ignore CLONE_PARENT (gVisor): each process is its own
 * child, forked without CLONE_PARENT, and it sends the frames serveReaping
 * sends: an answer frame for each request, then an exit frame (wait
 * status and rusage of wait4(2)) for each child it reaps. One thread does
 * both, woken by the socket or by SIGCHLD (a signalfd), so a pid's exit
 * frame is sent right after its wait4 and before the next start, which
 * alone could be handed the pid again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SOCKET_FD 3
#define ANSWER_SIZE 10
#define STAGE_FORK 0
#define STAGE_EXEC 1
#define MAX_REQUEST (64u << 20)
#define STACK_SIZE (64 * 1024)
#define FRAME_ANSWER 1
#define FRAME_EXIT 2
#define FRAME_SIZE (10 + sizeof(struct rusage))

/* reaping: the reaping mode, whose SIGCHLD is blocked (read from a
 * signalfd); its children get the empty mask back before execve. */
static int reaping;
static sigset_t no_signals;

/* The OOM score: the agent's (own) except around a clone (top). */
static int oom_fd = -1;
static char oom_own[32];
static size_t oom_own_len;

static void oom_set(const char *v, size_t n)
{
	if (oom_fd >= 0)
		(void)!pwrite(oom_fd, v, n, 0);
}

static void oom_prepare(void)
{
	int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror("berth-launcher: processes keep the agent's OOM score");
		return;
	}
	ssize_t n = pread(fd, oom_own, sizeof oom_own - 1, 0);
	while (n > 0 && (oom_own[n - 1] == '\n' || oom_own[n - 1] == ' '))
		n--;
	if (n <= 0 || pwrite(fd, "1000", 4, 0) != 4) {
		perror("berth-launcher: processes keep the agent's OOM score");
		close(fd);
		return;
	}
	if (pwrite(fd, oom_own, (size_t)n, 0) != n) {
		/* Stuck at the highest: children still get it, the launcher too. */
		perror("berth-launcher: the launcher keeps OOM score 1000");
		close(fd);
		return;
	}
	oom_fd = fd;
	oom_own_len = (size_t)n;
}

static int read_full(void *p, size_t n)
{
	char *b = p;
	while (n > 0) {
		ssize_t r = read(SOCKET_FD, b, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0) {
			errno = EPIPE;
			return -1;
		}
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

/* One request, decoded in place: the strings point into its body. */
struct request {
	int session;
	char *path, *dir;
	char **argv, **env, **sh_argv;
	int fds[3], nfds;
};

/* The child's side of a clone; it shares the launcher's memory. */
struct child {
	struct request *req;
	volatile int err;
};

static int child_main(void *arg)
{
	struct child *c = arg;
	struct request *r = c->req;
	int i;
	if (reaping && sigprocmask(SIG_SETMASK, &no_signals, NULL) < 0)
		goto fail;
	if (r->session ? setsid() < 0 : setpgid(0, 0) < 0)
		goto fail;
	if (r->dir[0] && chdir(r->dir) < 0)
		goto fail;
	for (i = 0; i < 3; i++)
		if (dup2(r->fds[i], i) < 0)
			goto fail;
	if (r->session && ioctl(0, TIOCSCTTY, 1) < 0)
		goto fail;
	execve(r->path, r->argv, r->env);
	if (errno == ENOEXEC)
		execve("/bin/sh", r->sh_argv, r->env);
fail:
	c->err = errno;
	_exit(127);
}

static char stack[STACK_SIZE] __attribute__((aligned(16)));

static int lack(int e)
{
	return e == EAGAIN || e == ENOMEM || e == EMFILE || e == ENFILE;
}

/* spawn clones r's process; it returns the pid, or 0 with *err and
 * *stage set. */
static int spawn(struct request *r, int *err, int *stage)
{
	int parent = reaping ? 0 : CLONE_PARENT;
	struct child c = {.req = r, .err = 0};
	if (r->nfds != 3) {
		*err = EMFILE;
		*stage = STAGE_FORK;
		return 0;
	}
	oom_set("1000", 4);
	int pid = clone(child_main, stack + STACK_SIZE, CLONE_VM | CLONE_VFORK | parent | SIGCHLD, &c);
	int e = errno;
	oom_set(oom_own, oom_own_len);
	if (pid < 0) {
		*err = e;
		*stage = lack(e) ? STAGE_FORK : STAGE_EXEC;
		return 0;
	}
	if (c.err) {
		/* The child has exited; its parent (the agent, or the launcher
		 * when CLONE_PARENT was ignored or not asked for) reaps it. */
		if (waitpid(pid, NULL, __WALL) < 0 && errno != ECHILD)
			perror("berth-launcher: wait for a failed child");
		*err = c.err;
		*stage = lack(c.err) ? STAGE_FORK : STAGE_EXEC;
		return 0;
	}
	return pid;
}

/* is_child reports whether pid is the launcher's own child: the kernel
 * ignored CLONE_PARENT (gVisor). WNOWAIT leaves its status to its reaper. */
static int is_child(int pid)
{
	siginfo_t info;
	for (;;) {
		if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0)
			return 1;
		if (errno != EINTR)
			return errno != ECHILD;
	}
}

/* read_request reads one request into r; its body is *body (freed by the
 * caller). It returns 1 for a request, 0 at EOF, -1 on an error. */
static int read_request(struct request *r, char **body)
{
	uint32_t len;
	char head[4];
	union {
		char buf[CMSG_SPACE(3 * sizeof(int))];
		struct cmsghdr align;
	} oob;
	struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = oob.buf, .msg_controllen = sizeof oob.buf};
	ssize_t n;
	memset(r, 0, sizeof *r);
	do
		n = recvmsg(SOCKET_FD, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		perror("berth-agent launcher: receive a request");
		return -1;
	}
	if (n == 0)
		return 0;
	if (!(msg.msg_flags & MSG_CTRUNC)) {
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int *fds = (int *)CMSG_DATA(cm);
			for (int i = 0; i < k; i++) {
				if (r->nfds < 3)
					r->fds[r->nfds++] = fds[i];
				else
					close(fds[i]);
			}
		}
	}
	if (read_full(head + n, sizeof head - (size_t)n) < 0)
		goto short_read;
	len = (uint32_t)(unsigned char)head[0] | (uint32_t)(unsigned char)head[1] << 8 |
	      (uint32_t)(unsigned char)head[2] << 16 | (uint32_t)(unsigned char)head[3] << 24;
	if (len < 1 || len > MAX_REQUEST) {
		fprintf(stderr, "berth-agent launcher: bad request length %u\n", len);
		return -1;
	}
	*body = malloc(len);
	if (!*body) {
		perror("berth-agent launcher: request");
		return -1;
	}
	if (read_full(*body, len) < 0)
		goto short_read;
	/* flags, then NUL-terminated: path, dir, argc, argv, env. */
	char *b = *body, *end = b + len;
	if (end[-1] != '\0')
		goto bad;
	r->session = b[0] == 1;
	size_t count = 0;
	for (char *p = b + 1; p < end; p++)
		count += *p == '\0';
	if (count < 3)
		goto bad;
	char **fields = calloc(count + 3, sizeof(char *));
	if (!fields) {
		perror("berth-agent launcher: request");
		return -1;
	}
	size_t i = 0;
	for (char *p = b + 1; p < end; p += strlen(p) + 1)
		fields[i++] = p;
	r->path = fields[0];
	r->dir = fields[1];
	char *tail;
	long argc = strtol(fields[2], &tail, 10);
	if (*tail || argc < 1 || (size_t)argc > count - 3) {
		free(fields);
		goto bad;
	}
	/* fields: [path dir argc argv... env... NULL] then room for sh_argv's
	 * two extra slots; argv and env are made NULL-terminated in copies. */
	char **argv = calloc((size_t)argc + 1, sizeof(char *));
	char **env = calloc(count - 3 - (size_t)argc + 1, sizeof(char *));
	char **sh = calloc((size_t)argc + 2, sizeof(char *));
	if (!argv || !env || !sh) {
		perror("berth-agent launcher: request");
		return -1;
	}
	memcpy(argv, fields + 3, (size_t)argc * sizeof(char *));
	memcpy(env, fields + 3 + argc, (count - 3 - (size_t)argc) * sizeof(char *));
	sh[0] = "/bin/sh";
	sh[1] = r->path;
	memcpy(sh + 2, argv + 1, (size_t)(argc - 1) * sizeof(char *));
	free(fields);
	r->argv = argv;
	r->env = env;
	r->sh_argv = sh;
	return 1;
short_read:
	perror("berth-agent launcher: receive a request");
	return -1;
bad:
	fprintf(stderr, "berth-agent launcher: bad request\n");
	return -1;
}

static void put32(unsigned char *b, uint32_t v)
{
	b[0] = v, b[1] = v >> 8, b[2] = v >> 16, b[3] = v >> 24;
}

static int write_full(const void *p, size_t n)
{
	const char *b = p;
	while (n > 0) {
		ssize_t w = write(SOCKET_FD, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* serve_one reads one request and starts its process. It returns 1 to go
 * on, 0 at EOF (the agent closed the socket), -1 on an error; *pid is the
 * process's, or 0. */
static int serve_one(unsigned char ans[ANSWER_SIZE], int *pid)
{
	struct request r;
	char *body = NULL;
	int got = read_request(&r, &body);
	if (got <= 0)
		return got;
	int err = 0, stage = STAGE_FORK;
	*pid = spawn(&r, &err, &stage);
	for (int i = 0; i < r.nfds; i++)
		close(r.fds[i]);
	free(r.argv);
	free(r.env);
	free(r.sh_argv);
	free(body);
	memset(ans, 0, ANSWER_SIZE);
	put32(ans, (uint32_t)*pid);
	put32(ans + 4, (uint32_t)err);
	ans[8] = (unsigned char)stage;
	return 1;
}

/* serve_leaving is the Launcher: its processes are the agent's children
 * (CLONE_PARENT). */
static int serve_leaving(void)
{
	for (;;) {
		unsigned char ans[ANSWER_SIZE];
		int pid = 0;
		int got = serve_one(ans, &pid);
		if (got <= 0)
			return got == 0 ? 0 : 1;
		/* A kernel that ignored CLONE_PARENT made the process ours, and
		 * only the agent reaps: leave, so that it is re-parented to the
		 * agent (init of the sandbox). */
		int leaving = pid > 0 && is_child(pid);
		ans[9] = (unsigned char)leaving;
		if (write_full(ans, sizeof ans) < 0 || leaving)
			return 0;
	}
}

/* reap_children reaps every child that has exited and sends its exit
 * frame. It returns -1 when the socket failed. */
static int reap_children(void)
{
	for (;;) {
		int status = 0;
		struct rusage ru;
		memset(&ru, 0, sizeof ru);
		pid_t pid = wait4(-1, &status, WNOHANG, &ru);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid <= 0)
			return 0; /* none exited (0) or none left (ECHILD) */
		unsigned char frame[FRAME_SIZE] = {0};
		frame[0] = FRAME_EXIT;
		put32(frame + 1, (uint32_t)pid);
		put32(frame + 5, (uint32_t)status);
		memcpy(frame + 10, &ru, sizeof ru);
		if (write_full(frame, sizeof frame) < 0)
			return -1;
	}
}

/* serve_reaping is the ReapingLauncher: its processes are its own
 * children, whose exits it reports. */
static int serve_reaping(void)
{
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0) {
		perror("berth-agent launcher: block SIGCHLD");
		return 1;
	}
	int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		perror("berth-agent launcher: signalfd");
		return 1;
	}
	reaping = 1;
	for (;;) {
		struct pollfd fds[2] = {{.fd = SOCKET_FD, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			perror("berth-agent launcher: poll");
			return 1;
		}
		if (fds[1].revents) {
			struct signalfd_siginfo si[8];
			while (read(sfd, si, sizeof si) > 0)
				;
			if (reap_children() < 0)
				return 0; /* the agent is gone */
		}
		if (fds[0].revents) {
			unsigned char ans[ANSWER_SIZE];
			int pid = 0;
			int got = serve_one(ans, &pid);
			if (got <= 0)
				return got == 0 ? 0 : 1;
			unsigned char frame[FRAME_SIZE] = {0};
			frame[0] = FRAME_ANSWER;
			memcpy(frame + 1, ans, 9); /* pid, errno, stage */
			if (write_full(frame, sizeof frame) < 0)
				return 0;
		}
	}
}

int main(int argc, char **argv)
{
	if (argc != 2 && !(argc == 3 && strcmp(argv[2], "reap") == 0)) {
		fprintf(stderr, "usage: berth-launcher NOFILE [reap]\n");
		return 2;
	}
	/* The processes started must not inherit the socket. */
	fcntl(SOCKET_FD, F_SETFD, FD_CLOEXEC);
	prctl(PR_SET_NAME, "berth-launcher", 0, 0, 0);
	sigemptyset(&no_signals);
	sigprocmask(SIG_SETMASK, &no_signals, NULL);
	oom_prepare();
	char *tail;
	unsigned long long nofile = strtoull(argv[1], &tail, 10);
	if (!*tail && nofile > 0) {
		struct rlimit lim;
		if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
			lim.rlim_cur = nofile < lim.rlim_max ? nofile : lim.rlim_max;
			if (setrlimit(RLIMIT_NOFILE, &lim) < 0)
				fprintf(stderr, "berth-agent launcher: RLIMIT_NOFILE %llu: %s\n", nofile, strerror(errno));
		}
	}
	return argc == 3 ? serve_reaping() : serve_leaving();
}
