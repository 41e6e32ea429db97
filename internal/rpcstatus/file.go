package rpcstatus

// Reason tokens of file operations (berth.v1.FileService). Each error that
// carries one also names the path concerned in ErrorInfo metadata "path"
// (display form: invalid UTF-8 bytes escaped as \xNN).
const (
	ReasonFileNotFound         = "FILE_NOT_FOUND"            // NOT_FOUND: the path or a parent is missing (ENOENT)
	ReasonFileExists           = "FILE_EXISTS"               // ALREADY_EXISTS: the target exists and may not be replaced (EEXIST)
	ReasonNotADirectory        = "NOT_A_DIRECTORY"           // FAILED_PRECONDITION: a path component is not a directory (ENOTDIR)
	ReasonIsADirectory         = "IS_A_DIRECTORY"            // FAILED_PRECONDITION: a file operation names a directory (EISDIR)
	ReasonDirectoryNotEmpty    = "DIRECTORY_NOT_EMPTY"       // FAILED_PRECONDITION: rmdir of a non-empty directory (ENOTEMPTY)
	ReasonSymlinkLoop          = "SYMLINK_LOOP"              // FAILED_PRECONDITION: too many symlinks in the path (ELOOP)
	ReasonCrossDevice          = "CROSS_DEVICE"              // FAILED_PRECONDITION: rename across file systems (EXDEV)
	ReasonReadOnlyFS           = "READ_ONLY_FILESYSTEM"      // FAILED_PRECONDITION: the file system is read-only (EROFS)
	ReasonFileBusy             = "FILE_BUSY"                 // FAILED_PRECONDITION: the path is in use, e.g. a mount point (EBUSY)
	ReasonNotRegularFile       = "NOT_A_REGULAR_FILE"        // FAILED_PRECONDITION: a read or write of a device, FIFO or socket
	ReasonFileTooLarge         = "FILE_TOO_LARGE"            // FAILED_PRECONDITION: a size cap of the agent is exceeded
	ReasonListTooLarge         = "LIST_TOO_LARGE"            // FAILED_PRECONDITION: a listing exceeds the agent's entry cap
	ReasonPermissionDenied     = "PERMISSION_DENIED"         // PERMISSION_DENIED: the workload user may not (EACCES, EPERM)
	ReasonFileChanged          = "FILE_CHANGED"              // ABORTED: the file changed while it was read
	ReasonNoSpace              = "NO_SPACE"                  // RESOURCE_EXHAUSTED: the file system is full (ENOSPC, EDQUOT)
	ReasonTarEntryUnsafe       = "TAR_ENTRY_UNSAFE"          // INVALID_ARGUMENT: an archive entry would escape its directory
	ReasonTarEntryInvalid      = "TAR_ENTRY_UNSUPPORTED"     // INVALID_ARGUMENT: an archive entry of a type berth does not extract
	ReasonArchiveInvalid       = "ARCHIVE_INVALID"           // INVALID_ARGUMENT: the upload is not a readable tar (or gzip) stream
	ReasonAgentCannotActAsUser = "WORKLOAD_USER_UNAVAILABLE" // FAILED_PRECONDITION: the agent lacks the capabilities to act as the workload user
	ReasonFileRefused          = "FILE_OPERATION_REFUSED"    // FAILED_PRECONDITION: the file or its file system refuses the operation as asked (EINVAL, EIO, ENXIO, EOPNOTSUPP, ...; metadata "errno")
)
