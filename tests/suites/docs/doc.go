// Package docs checks the documentation against the code: the reference
// tables list what the code defines, every relative link and anchor
// resolves, and the README and ARCHITECTURE stay the short pages they are.
package docs
