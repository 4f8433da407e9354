// Command idprobe prints the user it runs as, resolved through the
// container's /etc/passwd and /etc/group: "uid=<n> gid=<n> user=<name>
// group=<name>". The image tests mount it into an image and run it as the
// entrypoint, so the image's own User setting applies.
package main

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
)

func main() {
	uid, gid := os.Getuid(), os.Getgid()
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		fmt.Fprintf(os.Stderr, "idprobe: uid %d: %v\n", uid, err)
		os.Exit(1)
	}
	g, err := user.LookupGroupId(strconv.Itoa(gid))
	if err != nil {
		fmt.Fprintf(os.Stderr, "idprobe: gid %d: %v\n", gid, err)
		os.Exit(1)
	}
	fmt.Printf("uid=%d gid=%d user=%s group=%s\n", uid, gid, u.Username, g.Name)
}
