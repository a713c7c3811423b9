/* probe HOST PORT: exits 0 when a TCP connection to HOST:PORT (an IPv4 address) is accepted within
 * 3 s, 1 when it is not, 2 on bad arguments. devenv/node's test image: a pod running it shows the
 * pod network and kube-proxy's Service rules reach what they should, without a shell or a
 * registry. Built statically by devenv/node/images.py. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: probe HOST PORT\n");
        return 2;
    }
    struct sockaddr_in address = {0};
    address.sin_family = AF_INET;
    address.sin_port = htons((unsigned short)atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &address.sin_addr) != 1) {
        fprintf(stderr, "probe: %s is not an IPv4 address\n", argv[1]);
        return 2;
    }
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval timeout = {3, 0};
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    if (sock < 0 || connect(sock, (struct sockaddr *)&address, sizeof address) != 0) {
        perror("probe: connect");
        return 1;
    }
    printf("probe: connected to %s:%s\n", argv[1], argv[2]);
    close(sock);
    return 0;
}
